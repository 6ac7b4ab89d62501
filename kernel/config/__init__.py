"""config.pbtxt: parse and render, complete (defaults and auto-complete), validate."""
