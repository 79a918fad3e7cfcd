"""A shop's delivery helper: one agent, one tool of its own. ARLOOP_PACKS='["shop_pack:pack"]'."""

from pydantic import BaseModel, Field

from agents.packs import Pack
from agents.runtime import AgentSpec
from tools.base import Tool, ToolError

DAYS = {"france": 2, "germany": 3, "japan": 7}


class DeliveryArgs(BaseModel):
    country: str = Field(description="Where the parcel goes, e.g. 'France'.")


class DeliveryDays(Tool):
    """Our own tool: what it says is the model's observation; a ToolError it raises too."""

    name = "delivery_days"
    description = "Days a parcel takes to reach a country."
    Args = DeliveryArgs

    async def run(self, args: DeliveryArgs) -> str:
        days = DAYS.get(args.country.strip().lower())
        if days is None:
            raise ToolError(f"we do not ship to {args.country}; we ship to {', '.join(DAYS)}")
        return f"{days} days"


def pack() -> Pack:
    shop = AgentSpec(
        name="shop",
        description="Says how long delivery takes.",
        system_prompt="Call delivery_days for the country, then answer in one line.",
        tools=(DeliveryDays(),),
        max_steps=2,
    )
    return Pack("shop_pack", agents=(shop,))
