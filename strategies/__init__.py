"""Inputs for the harness: scenario strategies and the names of lifecycle features."""
