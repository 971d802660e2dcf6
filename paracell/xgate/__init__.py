"""XGates verifier and probe (a later issue)."""
