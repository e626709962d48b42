"""What the lab's measurements and the tests run instead of a real engine: an engine's rings and control block
written directly (`telemetry`), a process that answers the handshake and records calls (`engine`)."""
