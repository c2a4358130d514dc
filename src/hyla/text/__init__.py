"""Text generation from trained language-model runs."""
