"""Model servers: answer predict requests from a checkpoint (or the live ps shards), batching concurrent calls."""
