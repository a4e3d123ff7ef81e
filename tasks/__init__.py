"""Tasks: datasets, preprocessing and models, and the task registry."""
