"""Host half of the Pager (a later issue)."""
