"""Alembic environment for Blazar's log database. Blazar calls it in-process (blazar.events.migrate), handing
over a synchronous connection; the `alembic` command works too, with `-x db=PATH`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    db = context.get_x_argument(as_dictionary=True).get("db") or config.get_main_option("sqlalchemy.url")
    if not db:
        raise SystemExit("pass the database with: alembic -x db=PATH/blazar.db upgrade head")
    url = db if "://" in db else f"sqlite:///{db}"
    engine = create_engine(url)
    with engine.begin() as conn:
        context.configure(connection=conn, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
