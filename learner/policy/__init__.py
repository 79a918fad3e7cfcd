"""What the serving side also needs of the learner: the policy registry, model loading, chat formats."""
