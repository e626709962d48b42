"""gatherwise engine hooks: the logits->tokens path that runs inside every TP rank (torch).

What the engine and the sidecar share (modes, control word, shared-memory formats, config) is in the torch-free
`gatherwise` package.
"""
