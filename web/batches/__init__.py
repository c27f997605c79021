"""OpenAI's Batch and Files APIs: the routes, the batch and file stores in Redis, and the batch
consumer's tasks (``tasks``): ingest of an input file, and the settling of finished batches into
output and error files."""
