"""The aggregator: ensemble (or replica) prediction over model servers, answered by each request's deadline."""
