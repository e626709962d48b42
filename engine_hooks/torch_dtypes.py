"""The supported logits dtypes (gatherwise.logits_dtypes) as torch dtypes: the engine side's one map."""

from __future__ import annotations

import torch

from gatherwise.logits_dtypes import LOGITS_DTYPES

TORCH_LOGITS_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in LOGITS_DTYPES}
