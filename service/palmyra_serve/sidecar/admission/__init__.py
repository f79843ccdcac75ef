"""Who gets an engine slot: the plan, one protocol, fixed and adaptive admission, the limit arithmetic."""
