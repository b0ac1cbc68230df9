pytest_plugins = ["kit.pytest_plugin"]
