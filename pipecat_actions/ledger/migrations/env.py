"""Alembic environment of the ledger schema.

Migrations always run on a connection handed over by `pipecat_actions.ledger.migrate`
(``config.attributes["connection"]``): that code opens it with the same durability settings,
locking and URL handling as the ledger itself.
"""

from alembic import context

from pipecat_actions.ledger.schema import metadata

VERSION_TABLE = "pa_schema_version"

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "run ledger migrations with `pipecat-actions db upgrade URL`, not the alembic command"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
