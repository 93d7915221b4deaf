"""Heart study: lambda selection ceilings against OEHG (see README.md here)."""
