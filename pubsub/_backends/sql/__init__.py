"""The pub/sub over a SQL database of the backend kit: ``tables`` (the schema and statements),
``pubsub`` (``SQLPubSub``, generic over a database and a doorbell). The SQLite and Postgres
backends give it their database and their doorbell."""
