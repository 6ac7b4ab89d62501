"""Types a bound inference callable receives and returns (`pytriton.proxy` -> `kernel.proxy`)."""
