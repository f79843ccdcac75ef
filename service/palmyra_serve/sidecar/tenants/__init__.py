"""Tenants: who a key belongs to, what that tenant may use, and how much it used."""
