"""Sample data shipped inside the package (read with importlib.resources): MNIST's 5,000-row CSV and
TFRecord / fixed-length record samples written by TensorFlow. See README.md beside this file."""
