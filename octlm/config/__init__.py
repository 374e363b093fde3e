"""The settings, torch-free: `TrainConfig`, its rules, TOML files, the model's shape."""
