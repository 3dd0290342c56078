"""Example bots: the offline restaurant demo and the Daily voice bot."""
