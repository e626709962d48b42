"""Engine fingerprints: what the adapters rely on in an engine, recognised by what the code is, not by its version.

A point is one engine function, method, class or module-level name the adapters patch or read on the path from
the LM head to the sampled tokens (and the runner steps that call them, so that anything inserted between them is
noticed). Its fingerprint is its presence, its signature and a hash of its source: the definition parsed with
`ast`, docstrings dropped, dumped without positions, so formatting and comments do not change it and any code
change does. Source rather than bytecode: bytecode differs per Python version and needs the module imported
(which for an engine means its CUDA stack), while the AST is the same on every interpreter and reads straight
out of a wheel's files or an installed tree, so release wheels can be verified on a machine that cannot run them.

The fingerprints of every verified release are generated (`python -m gatherwise.engine_hooks.fingerprints.generate`)
into `data/`, never typed; `check` compares a live install against them.
"""
