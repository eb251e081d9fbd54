"""foxhunt: exact DQN / Rainbow training for trading agents and any discrete Gymnasium env."""
