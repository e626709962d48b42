"""`gatherwise bench serve`: real engine servers (vLLM, SGLang) with and without gatherwise, driven by the engines'
own benchmark clients (docs/bench_serve.md)."""
