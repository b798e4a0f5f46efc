"""The distributed batch backend: ``RedisBatches``, in distributed mode's shared Redis."""
