"""The experiment: the user's class, its marked fields and what they mean, its hooks."""
