"""Topology on record: `measurements.hosts`, `ranks_per_host` (integers) and `interconnect` (text), the hosts a
point's ranks spanned, the ranks on each and the links between them (`runners.topology`); nullable.

Measurements stored before were all measured by a single-host gang: one host, W ranks on it; their interconnect is
"none" for one rank and "loopback" for gloo ranks on a CPU; a GPU gang's link was not recorded (NULL).

Revision ID: 0006_topo, after 0005_unrel (no branch labels, no dependencies). Created 2026-12-02.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0006_topo", "0005_unrel"
BACKFILL = (
    'UPDATE measurements SET hosts = 1, ranks_per_host = (SELECT points."W" FROM points WHERE points.id = measurements.point_id)',
    "UPDATE measurements SET interconnect = 'none' WHERE ranks_per_host = 1",
    "UPDATE measurements SET interconnect = 'loopback' WHERE ranks_per_host > 1 "
    "AND environment_id IN (SELECT id FROM environments WHERE device_name = 'cpu')",
)


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("hosts", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("ranks_per_host", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("interconnect", sa.String(length=64), nullable=True))
    for statement in BACKFILL:
        op.execute(statement)


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("interconnect")
        batch.drop_column("ranks_per_host")
        batch.drop_column("hosts")
