"""A seeded fuzzer over every reader and file-taking option, driving the CLI in process (`cases`)."""
