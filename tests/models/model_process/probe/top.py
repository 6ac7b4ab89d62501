"""A module next to config.pbtxt: Triton puts the model folder on sys.path, so `import top` works."""

WHERE = "model folder"
