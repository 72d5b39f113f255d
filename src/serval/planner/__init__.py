"""Decide from measurements: hardware catalog (prices as data), cost plan, configuration tuner."""
