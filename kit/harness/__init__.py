"""The harness: running a case on a backend eager or as graphs, the backend protocol and registry, the guard and the checks a verdict is made of."""
