"""Small user plug-ins the tests name by import path (``tests.plugins.<module>:<name>``)."""
