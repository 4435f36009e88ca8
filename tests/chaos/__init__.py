"""The chaos suite's own parts (chaos/)."""
