"""The buffer mechanism (buffer, step, features, metrics) and the policies that steer it."""
