"""Inputs: file formats the readers parse and the data sets that ship with zmqflow."""
