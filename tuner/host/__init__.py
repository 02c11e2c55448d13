"""The machine a run happens on: which torch (and its private APIs), the hardware key decisions
are filed under, and child processes (sandbox, allowlisted environment)."""
