"""`gatherwise doctor`: the pre-flight a user runs in the engine's environment before starting the engine."""
