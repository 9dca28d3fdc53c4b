"""graphrt-capture: build, capture and verify a decode runtime from a YAML config."""
