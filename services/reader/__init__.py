"""The reader service: files (CSV, fixed-length records, TFRecord) in, instances into the broker's queues."""
