"""Unreliable measurements: `measurements.unreliable` (text, nullable), why a point's stop rule did not converge
(`runners.timing.unreliable_reason`); NULL when it stopped on the noise target.

Measurements stored before: those that stopped on "max_samples" or "timeout" are marked from their stop reason
(their `min_samples` was not kept, so only the stop reason is judged).

Revision ID: 0005_unrel, after 0004_prof (no branch labels, no dependencies). Created 2026-12-01.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0005_unrel", "0004_prof"
MARK = (
    "UPDATE measurements SET unreliable = 'stopped on ' || stop_reason || ' before the noise target (n=' "
    "|| CAST(n AS VARCHAR(16)) || ')' WHERE stop_reason IS NOT NULL AND stop_reason <> 'noise'"
)


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("unreliable", sa.String(length=255), nullable=True))
    op.execute(MARK)


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("unreliable")
