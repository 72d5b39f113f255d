"""Engines that run models: the Backend protocol and one module per engine."""
