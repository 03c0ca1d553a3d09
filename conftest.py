"""The repository's root conftest: loads the plugin that runs README.md's and docs/'s code blocks as tests."""

pytest_plugins = ["tests.docs.blocks"]
