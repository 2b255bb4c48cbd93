"""Command-line shells: parse arguments, call one library function, format its result."""
