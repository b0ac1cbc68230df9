"""The pytest face: the plugin, worker scheduling and start-up."""
