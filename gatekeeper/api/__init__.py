"""Talking to the API: keys, retries, the HTTP client (httpx errors mapped here), the queue read over every key."""
