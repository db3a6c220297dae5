"""The model manager's core, without Qt: the library, the Hugging Face Hub client, downloads and the CLI."""
