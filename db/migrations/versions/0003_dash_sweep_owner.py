"""Sweep owner: `sweeps.owner` (nullable, indexed), the token of the one worker that may claim a sweep's points
(`cpbench run` and `cpbench regress` work their own sweeps; NULL = any worker, as before).

Revision ID: 0003_dash
Revises: 0002_rel
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_dash"
down_revision: str | None = "0002_rel"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=128), nullable=True))
        batch.create_index("ix_sweeps_owner", ["owner"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_index("ix_sweeps_owner")
        batch.drop_column("owner")
