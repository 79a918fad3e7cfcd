"""The learner process (`arloop learn`): rounds, the eval gate's suite runs, release control."""
