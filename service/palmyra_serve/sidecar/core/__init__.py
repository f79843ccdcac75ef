"""The ground floor: the sidecar's vocabularies and plain types, importing nothing of the sidecar
above them (errors, routes, the request record, drain state, shares, the disconnect hook, the
metrics' names, lax readings of a body and its prompt estimate)."""
