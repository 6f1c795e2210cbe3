"""Block Stack Merges' stack model: configuration, commands and roles behind make up."""
