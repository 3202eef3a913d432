"""Scripts the tests run as processes (workers, a user's own loop, migrated examples)."""
