"""Who gets an engine slot: one protocol, fixed and adaptive admission, and the limit arithmetic."""
