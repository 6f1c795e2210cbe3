"""Loop-device lab kit: everything it creates is removed on exit, also on failure."""
