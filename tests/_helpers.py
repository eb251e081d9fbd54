"""Shared test settings (imported by the CLI-driven reliability tests)."""

# A tiny CartPole run (`--set KEY=VALUE` strings): about a second of training after imports.
TINY_CARTPOLE = {
    "hidden_sizes": "[32,32]",
    "learning_starts": 200,
    "batch_size": 32,
    "gradient_accumulation_steps": 1,
    "buffer_capacity": 5000,
    "train_freq": 4,
    "gradient_steps": 1,
    "target_update_interval": 50,
    "log_interval": 100,
}
