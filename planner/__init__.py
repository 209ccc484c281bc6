"""Training plans: the job and its parallel configurations, the search, plan files, placement and run costs."""
