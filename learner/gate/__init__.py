"""Release control: the eval gate, its guards and statistics, off-policy estimates, release moves, canary."""
