//! ROS 2 message definitions (`.msg` text, dependencies appended in the `ros2msg` schema form
//! that `ros2 bag record` writes into MCAP) for the types replay writes. A viewer (Foxglove,
//! rviz through rosbag2) decodes a CDR message with its channel's schema, so an output bag
//! without them would be unreadable there.

const SEP: &str =
    "================================================================================\n";

const HEADER: &str = "MSG: std_msgs/Header\n\
# Standard metadata for higher-level stamped data types.\n\
builtin_interfaces/Time stamp\n\
string frame_id\n";

const TIME: &str = "MSG: builtin_interfaces/Time\n\
int32 sec\n\
uint32 nanosec\n";

const POINT_FIELD: &str = "MSG: sensor_msgs/PointField\n\
uint8 INT8    = 1\n\
uint8 UINT8   = 2\n\
uint8 INT16   = 3\n\
uint8 UINT16  = 4\n\
uint8 INT32   = 5\n\
uint8 UINT32  = 6\n\
uint8 FLOAT32 = 7\n\
uint8 FLOAT64 = 8\n\
string name\n\
uint32 offset\n\
uint8  datatype\n\
uint32 count\n";

const POINT_CLOUD2: &str = "std_msgs/Header header\n\
uint32 height\n\
uint32 width\n\
PointField[] fields\n\
bool    is_bigendian\n\
uint32  point_step\n\
uint32  row_step\n\
uint8[] data\n\
bool is_dense\n";

const IMAGE: &str = "std_msgs/Header header\n\
uint32 height\n\
uint32 width\n\
string encoding\n\
uint8 is_bigendian\n\
uint32 step\n\
uint8[] data\n";

const COMPRESSED_IMAGE: &str = "std_msgs/Header header\n\
string format\n\
uint8[] data\n";

const OCCUPANCY_GRID: &str = "std_msgs/Header header\n\
MapMetaData info\n\
int8[] data\n";

const MAP_META_DATA: &str = "MSG: nav_msgs/MapMetaData\n\
builtin_interfaces/Time map_load_time\n\
float32 resolution\n\
uint32 width\n\
uint32 height\n\
geometry_msgs/Pose origin\n";

const POSE: &str = "MSG: geometry_msgs/Pose\n\
Point position\n\
Quaternion orientation\n";

const POINT: &str = "MSG: geometry_msgs/Point\n\
float64 x\n\
float64 y\n\
float64 z\n";

const QUATERNION: &str = "MSG: geometry_msgs/Quaternion\n\
float64 x 0\n\
float64 y 0\n\
float64 z 0\n\
float64 w 1\n";

const CAMERA_INFO: &str = "std_msgs/Header header\n\
uint32 height\n\
uint32 width\n\
string distortion_model\n\
float64[] d\n\
float64[9] k\n\
float64[9] r\n\
float64[12] p\n\
uint32 binning_x\n\
uint32 binning_y\n\
RegionOfInterest roi\n";

const REGION_OF_INTEREST: &str = "MSG: sensor_msgs/RegionOfInterest\n\
uint32 x_offset\n\
uint32 y_offset\n\
uint32 height\n\
uint32 width\n\
bool do_rectify\n";

const TF_MESSAGE: &str = "geometry_msgs/TransformStamped[] transforms\n";

const TRANSFORM_STAMPED: &str = "MSG: geometry_msgs/TransformStamped\n\
std_msgs/Header header\n\
string child_frame_id\n\
Transform transform\n";

const TRANSFORM: &str = "MSG: geometry_msgs/Transform\n\
Vector3 translation\n\
Quaternion rotation\n";

const VECTOR3: &str = "MSG: geometry_msgs/Vector3\n\
float64 x\n\
float64 y\n\
float64 z\n";

/// The main definition followed by each dependency, separated as `ros2msg` schemas are.
fn join(main: &str, deps: &[&str]) -> String {
    let mut s = main.to_string();
    for d in deps {
        s.push_str(SEP);
        s.push_str(d);
    }
    s
}

/// The `ros2msg` schema text of a type replay writes (`sensor_msgs/msg/PointCloud2`, `Image`,
/// `CompressedImage`, `nav_msgs/msg/OccupancyGrid`; `CameraInfo` and `tf2_msgs/msg/TFMessage`
/// for bags made in tests), `None` for any other type.
pub fn definition(type_name: &str) -> Option<String> {
    Some(match type_name {
        "sensor_msgs/msg/PointCloud2" => join(POINT_CLOUD2, &[HEADER, TIME, POINT_FIELD]),
        "sensor_msgs/msg/Image" => join(IMAGE, &[HEADER, TIME]),
        "sensor_msgs/msg/CompressedImage" => join(COMPRESSED_IMAGE, &[HEADER, TIME]),
        "sensor_msgs/msg/CameraInfo" => join(CAMERA_INFO, &[HEADER, TIME, REGION_OF_INTEREST]),
        "tf2_msgs/msg/TFMessage" => join(
            TF_MESSAGE,
            &[TRANSFORM_STAMPED, HEADER, TIME, TRANSFORM, VECTOR3, QUATERNION],
        ),
        "nav_msgs/msg/OccupancyGrid" => join(
            OCCUPANCY_GRID,
            &[HEADER, TIME, MAP_META_DATA, POSE, POINT, QUATERNION],
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_are_listed_once_each() {
        let d = definition("nav_msgs/msg/OccupancyGrid").unwrap();
        assert!(d.starts_with("std_msgs/Header header\n"));
        for dep in [
            "MSG: std_msgs/Header",
            "MSG: nav_msgs/MapMetaData",
            "MSG: geometry_msgs/Quaternion",
        ] {
            assert_eq!(d.matches(dep).count(), 1, "{dep}");
        }
        assert!(definition("sensor_msgs/msg/Imu").is_none());
    }
}
